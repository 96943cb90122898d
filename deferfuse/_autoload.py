"""PyTorch's entry point for out-of-tree device backends (group `torch.backends`, called at the end of
`import torch` unless TORCH_DEVICE_BACKEND_AUTOLOAD=0): importing deferfuse registers "tpu" and
applies the environment's default mode, so a script written for CUDA runs with "cuda" changed to
"tpu" and no `import deferfuse`.

A module of its own, so that `import deferfuse` before `import torch` works too: torch then calls
this while deferfuse is still being imported, and the import below returns the module as it is."""


def load() -> None:
    import deferfuse  # noqa: F401  (the package's import does the registering)
