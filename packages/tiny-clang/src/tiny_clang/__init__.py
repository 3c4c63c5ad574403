"""tiny-clang: the CLANG (C) and LLVM (LLVM IR) CPU devices of tiny, running kernels on every core.

Modules: renderer (ClangRenderer), llvmir (LLVMRenderer), compiler (ClangCompiler, LLVMCompiler), runtime (ClangProgram,
LLVMProgram, ClangAllocator), pool (the native thread pool), graph (CPUGraph for TinyJit), plugin (the tiny entry point).
"""
__version__ = "0.1.0"
