"""Batch jobs, as OpenAI's Batch API defines them: uploaded input files of request lines, batches that run
those lines through the same core calls as direct requests, behind them, and output and error files.

- :mod:`service.batches.database`: the SQL databases the state lives in (SQLite on one host, or a
  PostgreSQL server that replicas share);
- :mod:`service.batches.store`: the durable state (a database beside a files directory), a batch cut into
  chunks of lines that workers claim, finish once and record;
- :mod:`service.batches.lines`: an input file read and checked line by line, and one line run as the
  direct request to its endpoint would be;
- :mod:`service.batches.worker`: the loop that validates batches, runs their chunks and writes their output.
"""
