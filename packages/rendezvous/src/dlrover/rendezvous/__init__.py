"""dlrover.rendezvous.

Elastic rendezvous rounds, stable rank assignment, node-check pairing, a KV store and a torchrun
rendezvous handler plugin.
"""

__all__: list[str] = []
