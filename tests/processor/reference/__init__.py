"""A plain reference of the processor's detection, the oracle its engine must agree with.

:func:`reference.reference.detect` takes OTLP trace requests (protobuf bytes, in arrival order) and
gives the counts the processor serves (:class:`reference.reference.Metrics`), read through the
OTLP protobuf classes and the dialect table of :mod:`reference.dialects`, with no speed tricks.
``test_reference.py`` holds the detector to it.
"""
