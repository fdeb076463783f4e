/* The Python module `engine._C`. Importing it loads this library, whose
 * static initializers register the ops with torch's dispatcher; the module
 * itself is empty. Only the limited API is used, so one abi3 build serves
 * every CPython >= 3.8 (Py_LIMITED_API is set by CMake's USE_SABI). */
#include <Python.h>

static struct PyModuleDef engine_c_module = {
    PyModuleDef_HEAD_INIT, "_C",
    "Compiled kernels of vllm-engine; the ops live in torch.ops._C.", -1, NULL,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&engine_c_module); }
