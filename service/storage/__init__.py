"""The floor under files, batches and vector stores: what they share, and nothing of any one of them.

- :mod:`service.storage.database`: the SQL databases (SQLite on one host, or a PostgreSQL server that replicas
  share);
- :mod:`service.storage.storage`: one root folder and one database, its clock, the tables each domain creates;
- :mod:`service.storage.leases`: claims on rows, renewed while a worker works and taken over once they run out;
- :mod:`service.storage.ids`: object ids in OpenAI's style;
- :mod:`service.storage.paging`: lists paged as OpenAI's are;
- :mod:`service.storage.service`: the storage as the app holds it, opened once on first use.
"""
