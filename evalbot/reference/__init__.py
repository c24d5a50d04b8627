"""evalbot's own reference: llama.cpp (the pinned portable llama-cpp-python build, `build`) scoring and
auditing token ids (`llama`, its command line `cli`: ``python -m evalbot.reference``), the registry's
models fetched and verified (`registry`), and the KL statistics of an engine's scores against it
(`compare`). The harness runs these trusted, from its own interpreter: a contest's engine (a C++ server,
an HTTP engine, a Python package) never has to bring them."""
