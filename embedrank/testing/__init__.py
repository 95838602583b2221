"""Test doubles and helpers, shipped so that users' own tests can use them too.

``fake`` (deterministic weightless encoders and cross-encoders for fast HTTP tests), ``seeded`` (a small
local cross-encoder with a seeded head, for offline tests) and ``launch`` (start the service as a
subprocess and wait until it is ready; needs ``httpx``, a development dependency). Nothing in the core
imports this package except to serve the ``fake:`` models named in a service configuration.
"""
