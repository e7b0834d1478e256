"""Every layer's commit in one launch, each program's table loads beside its plan loads
(``KDA_DESIGN=commit-layers=one-launch-tables-first``; shipped tiles): its state loads wait
for one memory round trip, not two."""

from benchmarks.variants.overrides import environment, wrap_api

wrap_api(globals(), lambda: environment(KDA_DESIGN="commit-layers=one-launch-tables-first"))
