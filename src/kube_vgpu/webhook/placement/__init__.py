"""Where a vGPU pod may go: the cluster's GPU inventory, the pod's selectors, the node affinity they
become, the bounds on that work, and whether the pod can ever fit.
"""
