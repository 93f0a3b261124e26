"""`speculax bench`: a matrix of methods on named prompt suites against autoregressive decoding."""
