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


def buildkit_parser():
    """BuildKit's Dockerfile parser (PyPI `dockerfile`). ci/test.sh installs it, as it installs
    hadolint: a missing parser is a broken test environment, so the test fails (never skips)."""
    import pytest

    try:
        import dockerfile
    except ImportError as exc:
        pytest.fail(f"BuildKit's Dockerfile parser is missing ({exc}): pip install -r tests/requirements.txt")
    return dockerfile
