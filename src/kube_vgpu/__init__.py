"""kube-vgpu: GPU sharing for Kubernetes. One import package; each part is a subpackage:
`webhook` admits pods, `node` serves the kubelet, `certs` makes certificates, `contract` is what they share,
`kubeapi` is the one door to the Kubernetes API, `standins` replace the engines that cannot run locally.
"""
