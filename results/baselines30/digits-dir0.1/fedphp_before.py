"""fedphp-pfllib as it was before the fix: μ_R = μ(R+1)/T (R the rounds done)."""
from algorithms.fedphp import FedPHPPfllib, TEACHER


class FedPHPPfllibBefore(FedPHPPfllib):
    name = "fedphp-pfllib-before"
    title = "FedPHP-PFLlib (before)"

    def broadcast(self, client, server, at):
        out = super(FedPHPPfllib, self).broadcast(client, server, at)
        mu = self.hp.mu * at.number / at.total
        keys = self.net.param_keys
        own = {k: (1 - mu) * server[k] + mu * client[k] for k in keys}
        return {**out, **own, **{TEACHER + k: server[k] for k in keys}}
