"""Claude Agent SDK tests: the real SDK and the Claude Code CLI its wheel bundles, on a scripted model.

Each test starts ``scripted_api.ScriptedAPI`` on 127.0.0.1 (and stops it); the CLI is pointed at it
with ``ANTHROPIC_BASE_URL``, its non-essential traffic off and its configuration in a temporary
folder. Every CLI the SDK starts is closed by the SDK when its run ends.
"""
