"""The farm's services, each one concern over the stores, composed by `Farm` (app/farm.py):
admission (`admission.py`), the queues' backlog and run times (`backlog.py`), the workers'
liveness and the GPU memory rule (`liveness.py`), the sweeps that right what a crash left
(`sweeps.py`).
"""
