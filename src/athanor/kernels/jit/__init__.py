"""The Triton kernels themselves. Importing anything here imports Triton: the dispatchers in
`athanor.kernels` import these modules lazily, only when a kernel is about to run in Triton."""
