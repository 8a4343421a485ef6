"""Real agent CLIs (Claude Code, Codex CLI, opencode) driven against a scripted fake upstream, directly and through
``agentcache proxy``. The traffic is generated at test time: these clients' prompts are not ours to commit."""
