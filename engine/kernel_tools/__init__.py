"""Tooling around the kernels, apart from them: Kimi's GEMV shapes (`shapes`), each operation's input
cases (`cases`), bytes moved (`traffic`), the variant-against-reference check (`equivalence`), ahead-of-time
compilation and launch capture (`aot`), the decode kernel count (`kernel_count`) and `kimi-engine kernels`
(`cli`). The kernels, their references and the registry stay in `engine.kernels`; nothing there imports this."""
