"""kubeapi"""
