"""flwr.server.strategy.fedavg.FedAvg (0.17): only the constructor's bookkeeping, which is
all MyFedAvg uses from it (it overrides aggregate_fit)."""


class FedAvg:
    def __init__(self, *, fraction_fit=0.1, fraction_eval=0.1, min_fit_clients=2, min_eval_clients=2,
                 min_available_clients=2, eval_fn=None, on_fit_config_fn=None, on_evaluate_config_fn=None,
                 accept_failures=True, initial_parameters=None):
        self.fraction_fit = fraction_fit
        self.fraction_eval = fraction_eval
        self.min_fit_clients = min_fit_clients
        self.min_eval_clients = min_eval_clients
        self.min_available_clients = min_available_clients
        self.eval_fn = eval_fn
        self.on_fit_config_fn = on_fit_config_fn
        self.on_evaluate_config_fn = on_evaluate_config_fn
        self.accept_failures = accept_failures
        self.initial_parameters = initial_parameters

    def initialize_parameters(self, client_manager=None):
        params = self.initial_parameters
        self.initial_parameters = None  # Flower 0.17 hands them out once
        return params
