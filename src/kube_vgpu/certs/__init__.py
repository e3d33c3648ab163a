"""The webhook's certificates: a CA and a serving certificate, kept valid in a Secret or in files.

`issue` mints, `check` judges stored material, `plan` decides what to re-issue (the CA rule lives
there), `cluster` reads and writes the Secret and the webhook configuration's caBundle, `files`
writes a directory atomically, `cli` is `kube-vgpu certs`; `errors` lists the failures and exit codes.
"""
