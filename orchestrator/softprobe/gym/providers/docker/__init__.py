"""The Docker provider: episode containers on a Docker engine (the only importer of ``docker``)."""
