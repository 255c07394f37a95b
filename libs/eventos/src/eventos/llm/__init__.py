"""LLM steps (SPEC §4 workers-llm, §9 class queues, §17 providers): providers (`providers`,
`local`, `openai`), the `llm_step` activity (`activity`) and the class-queue workers
(`worker`). Import the module you need: this package imports nothing, so a service that only
reads the operator's endpoints (the ingress) does not load the Temporal worker with them."""
