"""The kubelet-facing device plugin: the gRPC server and Allocate (which pod, the scheduler's booking
checked against the container's limits, what the container gets).
"""
