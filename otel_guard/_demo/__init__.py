"""``otel-guard demo``: the Planner / Budget loop in one process (:mod:`.travel`), and with
``--stack`` across two agent processes (:mod:`.agent`) and a processor (:mod:`.stack`).

A wing of its own that only the CLI loads, when asked: importing ``otel_guard`` loads none of it.
"""
