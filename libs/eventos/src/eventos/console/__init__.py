"""The web console (SPEC §17; docs/console.md): static files served by ingress at `/console`,
and the bounded reads it shows that no other `/v1/` operation gives (summaries, conversations,
turns, chat history). The console is a pure client of the owner API: one authorization path."""
