"""Plain views of a Dockerfile parsed by BuildKit's parser (PyPI `dockerfile`), shared by the
Dockerfile tests."""


def stages(commands):
    """[(name, base, [commands])] in order; name is None for an unnamed stage."""
    out = []
    for c in commands:
        if c.cmd.upper() == "FROM":
            name = c.value[2] if len(c.value) >= 3 and c.value[1].upper() == "AS" else None
            out.append((name, c.value[0], []))
        elif out:
            out[-1][2].append(c)
    return out


def global_args(commands):
    """{name: default} of the ARGs before the first FROM."""
    args = {}
    for c in commands:
        if c.cmd.upper() == "FROM":
            break
        if c.cmd.upper() == "ARG":
            for token in c.value:
                name, _, default = token.partition("=")
                args[name] = default
    return args
