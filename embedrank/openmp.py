"""How long torch's idle OpenMP threads spin, bounded before torch loads.

torch's CPU ops run on GNU OpenMP (libgomp) threads, which after each parallel region spin for a while before
they sleep (300,000 turns by default). With an exported runtime the only torch ops are the small ones around
the forward pass (pooling, padding): their threads then spin through the start of the next OpenVINO or ONNX
Runtime forward pass and take a core from it. Measured on 2 cores (MiniLM, batches of 16 short
queries): the OpenVINO int8 forward pass took 9.0 ms right after a pooling step instead of 6.2 ms; with the
spin bounded to 10,000 turns, ``Encoder.encode`` of such a batch ran 17% (int8) and 6% (fp32) faster, batches
of 32 SciFact queries 2-8%, and the torch backend's speed did not change (``OMP_WAIT_POLICY=PASSIVE``, no
spinning at all, cost the torch backend 13%).

libgomp reads its settings once, when torch loads it, so :func:`bound_spinning` runs when this module is
imported, first thing in ``import embedrank``; imported after torch, it can change nothing (a notebook that
imported torch first keeps libgomp's default). A ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` the user set is kept.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

SPINCOUNT = "10000"


def bound_spinning(environ: MutableMapping[str, str] = os.environ, loaded: Mapping[str, object] = sys.modules) -> bool:
    """Set ``GOMP_SPINCOUNT`` to :data:`SPINCOUNT` in ``environ`` unless the user chose a spin or wait policy
    or torch is already ``loaded``; True when it was set.

    >>> env = {}
    >>> bound_spinning(env, {}), env
    (True, {'GOMP_SPINCOUNT': '10000'})
    >>> bound_spinning({"OMP_WAIT_POLICY": "ACTIVE"}, {}), bound_spinning({}, {"torch": object()})
    (False, False)
    """
    if "torch" in loaded or "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ:
        return False
    environ["GOMP_SPINCOUNT"] = SPINCOUNT
    return True


BOUNDED = bound_spinning()  # whether this import set GOMP_SPINCOUNT (child processes inherit it)
