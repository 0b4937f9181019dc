"""Loading the compiled extension and its Python registrations: the version
check at load, the eager fast path of the ops, fake kernels and fake classes."""
