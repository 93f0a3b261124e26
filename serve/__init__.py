"""Serving a stream of requests: the serving loop, recording what verification computed, the replay buffer and the online learner."""
