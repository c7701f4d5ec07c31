"""Pin tooling for versions.json: `python3 -m ci.pins verify|resolve|args`.

Standard library only, so it runs on any machine with Python 3.9+.
"""
