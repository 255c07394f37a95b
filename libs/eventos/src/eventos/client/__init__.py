"""The owner API's client side (SPEC §17): a small synchronous HTTP client (`owner_api`) and
the server-sent events reader (`sse`), used by `eventosctl`, `make run` and the tests."""
