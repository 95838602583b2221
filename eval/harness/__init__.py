"""What the benchmarks share: the record and its pages, load generators and clients, statistics, synthetic
stores."""
