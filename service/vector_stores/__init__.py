"""OpenAI's Vector Stores API over the library's retrieve-then-rerank core: stores of chunks in the batch store's
database, a worker that reads attached files, and each replica's search indexes."""
