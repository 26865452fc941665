#include "teacher_c.h"

#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>

#include "qmesh/error.h"
#include "teacher.h"

struct example_teacher {
  examples::TeacherTask task;
};

namespace {

// Runs f; a C++ exception becomes `fallback` with its message on stderr (none crosses into C).
template <class F, class R>
R reporting(const char* function, R fallback, F f) {
  try {
    return f();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", function, e.what());
    return fallback;
  }
}

}  // namespace

extern "C" {

example_teacher* example_teacher_create(int64_t hidden, uint64_t seed) {
  return reporting(__func__, static_cast<example_teacher*>(nullptr), [&] {
    return std::make_unique<example_teacher>(examples::TeacherTask(hidden, seed)).release();
  });
}

void example_teacher_destroy(example_teacher* teacher) { delete teacher; }

int example_teacher_batch(const example_teacher* teacher, int64_t step, int64_t first,
                          int64_t tokens, float* x, float* t) {
  return reporting(__func__, -1, [&] {
    QMESH_CHECK(teacher && x && t, "the teacher, x and t must not be NULL");
    QMESH_CHECK(tokens >= 0, "tokens must be >= 0, got ", tokens);
    const qmesh::Shape shape{tokens, teacher->task.hidden()};
    teacher->task.batch(step, first, qmesh::TensorView(x, qmesh::DType::kFloat32, shape),
                        qmesh::TensorView(t, qmesh::DType::kFloat32, shape));
    return 0;
  });
}

double example_teacher_mean_predictor_loss(const example_teacher* teacher) {
  return reporting(__func__, std::nan(""), [&] {
    QMESH_CHECK(teacher, "the teacher must not be NULL");
    return teacher->task.mean_predictor_loss();
  });
}

}  // extern "C"
