"""Method sets for `speculax bench --config <name>`: each file defines BENCH, a BenchConfig."""
