"""pytest-cbatch: SGLang's real ``Scheduler`` on CPU with a stand-in model worker."""
