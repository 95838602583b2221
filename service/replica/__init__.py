"""A replica as several processes: ``python -m service`` with ``fronts = N`` (``EMBEDRANK_FRONTS``).

- :mod:`service.replica.supervisor` binds the listening socket, starts the processes below, replaces a front that
  dies, starts the engine process again when it dies, and stops them all on SIGTERM (fronts first, so that the
  requests they hold finish on the engine, then the engine process).
- :mod:`service.replica.engine`: one engine process. It loads the models, runs every forward pass in its batching
  engines (one fair queue and one estimated wait per model for all fronts: the 429 decisions are taken there) and
  serves them on a Unix socket (:class:`~embedrank.serving.remote.EngineHost`); the batch jobs, the vector
  stores' file reading and their searches run there too, once per replica: each store's index is held there, once,
  and searched for every front.
- :mod:`service.replica.front`: N front processes, sharing the listening socket. Each is the app of
  :func:`service.app.create_app` in front mode: HTTP, authentication, decoding, limits, tokenizing (its models are
  loaded without their weights) and answers; the forward passes and the stores' searches go to the engine process.

With ``fronts = 0`` (the default) ``python -m service`` serves in one process, as ``litestar run`` does.
"""

FRONTS_READY_CALL = "replica_fronts_ready"
"""The engine process's call (:meth:`embedrank.serving.remote.EngineHost.answer`) that counts the fronts ready now
(those connected whose last report said so): a front's ``/health`` is 200 once it and every other front are."""

ENGINE_SOCKET_ENV = "EMBEDRANK_ENGINE_SOCKET"
"""Set for a replica's front processes: the engine process's Unix socket (a front's app reads it)."""
