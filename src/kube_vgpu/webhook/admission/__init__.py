"""The two admission phases as pure decisions: the AdmissionReview wire format, mutation, validation,
the pod-shape check and the safety and isolation rules.
"""
