"""The HTTP API fuzzed: schemathesis with every check, and the edge cases each operation's schema allows."""
