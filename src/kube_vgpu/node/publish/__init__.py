"""What the node tells the cluster: the register annotation, labels and capacity, kept true on the Node."""
