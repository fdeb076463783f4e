// A recorded run of ops replayed from C++ (engine/worker/cpu_graph.py records
// a decode step's ops once and hands them here): each call is an operator
// handle and its whole argument stack, so a replay pays the dispatcher's boxed
// call per op and nothing of Python's (module calls, views, argument parsing),
// which on a deep narrow model cost a decode step as much as its weights.
// Device independent: the dispatcher picks each op's kernel as it did eagerly.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <string>
#include <utility>
#include <vector>

namespace engine {

struct StepGraph : torch::CustomClassHolder {
  std::vector<std::pair<c10::OperatorHandle, std::vector<c10::IValue>>> calls;

  // name "aten::mm", overload "out" ("" for the default); args: every
  // argument of the schema in order, defaults filled in by the recorder.
  void add(const std::string& name, const std::string& overload,
           const c10::List<c10::IValue>& args) {
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
    const auto& schema_args = op.schema().arguments();
    TORCH_CHECK(schema_args.size() == args.size(), name, ".", overload, " takes ",
                schema_args.size(), " arguments, the recorder gave ", args.size());
    std::vector<c10::IValue> stack;
    stack.reserve(args.size());
    for (size_t i = 0; i < args.size(); ++i) {
      c10::IValue v = args.get(i);
      // a Python int list arrives as int[]; a float where the schema wants one
      // may arrive as an int: the boxed kernel reads each by its schema's type
      const auto& type = schema_args[i].type();
      TORCH_CHECK(v.isNone() || v.type()->isSubtypeOf(*type) ||
                      (type->kind() == c10::TypeKind::FloatType && v.isInt()) ||
                      type->kind() == c10::TypeKind::NumberType,
                  name, ".", overload, ": argument ", schema_args[i].name(), " is ",
                  v.type()->str(), ", the schema wants ", type->str());
      if (type->kind() == c10::TypeKind::FloatType && v.isInt()) {
        v = c10::IValue(static_cast<double>(v.toInt()));
      }
      stack.push_back(std::move(v));
    }
    calls.emplace_back(op, std::move(stack));
  }

  void run() const {
    torch::jit::Stack stack;
    for (const auto& [op, args] : calls) {
      stack = args;
      op.callBoxed(stack);
    }
  }

  int64_t size() const { return static_cast<int64_t>(calls.size()); }
};

void step_graph_run(const c10::intrusive_ptr<StepGraph>& graph) { graph->run(); }

}  // namespace engine

TORCH_LIBRARY_FRAGMENT(_C, m) {
  m.class_<engine::StepGraph>("StepGraph")
      .def(torch::init<>())
      .def("add", &engine::StepGraph::add)
      .def("size", &engine::StepGraph::size);
  // an op, not a method: torch.ops releases the GIL for the replay's length
  m.def("step_graph_run(__torch__.torch.classes._C.StepGraph graph) -> ()",
        &engine::step_graph_run);
}
