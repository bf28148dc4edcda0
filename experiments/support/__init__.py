"""What the tests and the benchmarks both run against: the OpenAI-protocol stub (`openai_stub`,
`python -m experiments.openai_stub`), starting and stopping local servers (`servers`) and fakes
(`fakes`: LLM steps that answer at once). It imports nothing of the harness."""
