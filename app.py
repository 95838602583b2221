"""``litestar run`` from the repo root finds the service here, by Litestar's own autodiscovery (a module
named ``app`` in the working directory with a ``create_app`` factory), whatever environment Litestar is
installed in. ``uvicorn --factory service.app:create_app`` is the equivalent without Litestar's CLI."""

from service.app import create_app

__all__ = ["create_app"]
