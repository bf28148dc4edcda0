"""Performance and real-server tooling: a local llama.cpp OpenAI-compatible server for e2e tests."""
