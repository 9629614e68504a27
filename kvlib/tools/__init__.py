"""The tooling around the ideas: data preparation, integrity, loading, training, benchmarks, demo, CLI.

Tools import the core (``kvlib.*``) and never the other way round.
"""
