"""Batch jobs, as OpenAI's Batch API defines them: uploaded input files of request lines, batches that run
those lines through the same core calls as direct requests, behind them, and output and error files.

- :mod:`service.batches.store`: the durable state (rows in the service's storage, :mod:`service.storage`, and
  files in its file store, :mod:`service.files`), a batch cut into chunks of lines that workers claim, finish once
  and record;
- :mod:`service.batches.lines`: an input file read and checked line by line, and one line run as the
  direct request to its endpoint would be;
- :mod:`service.batches.worker`: the loop that validates batches, runs their chunks and writes their output.
"""
