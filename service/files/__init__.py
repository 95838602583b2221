"""OpenAI's Files API: uploads (a batch's input, a vector store's documents) and the files the service writes (a
batch's output and errors), shared by the batches and the vector stores that use them.

- :mod:`service.files.store`: the files' rows and bytes in the service's storage, and the domains that hold them;
- :mod:`service.files.service`: the store as the app holds it, opened on first use;
- :mod:`service.files.schemas`, :mod:`service.files.routes`: ``/v1/files`` with OpenAI's file objects.
"""
