from .fedavg import FedAvg  # noqa: F401
