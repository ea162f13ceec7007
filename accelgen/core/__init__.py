"""The core layer, under everything else: a request's state, the paged KV block manager, one
iteration's batch shape and pivot, the policy interface (the view a policy sees and the decision
it returns), and the pydantic specs of a deployment and a run. It imports nothing of
``accelgen`` above it (``tests/test_layers.py``)."""
