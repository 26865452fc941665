/* The training examples' synthetic teacher task (teacher.h) for C programs: the same data, bit
 * for bit, as examples::TeacherTask. Part of the examples, not of qmesh's C API. */
#ifndef QMESH_EXAMPLES_TEACHER_C_H_
#define QMESH_EXAMPLES_TEACHER_C_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct example_teacher example_teacher;

/* The teacher of hidden size `hidden` (> 0) drawn from `seed`; NULL on failure, with the
 * reason on stderr. Free it with example_teacher_destroy (NULL is a no-op). */
example_teacher* example_teacher_create(int64_t hidden, uint64_t seed);
void example_teacher_destroy(example_teacher* teacher);
/* Fills x and t (fp32 host, row-major [tokens, hidden], caller-owned) with tokens
 * [first, first + tokens) of `step`. 0 on success; -1 on failure, with the reason on stderr. */
int example_teacher_batch(const example_teacher* teacher, int64_t step, int64_t first,
                          int64_t tokens, float* x, float* t);
/* The loss of predicting each target feature's mean (the baseline to beat); NaN on failure,
 * with the reason on stderr. */
double example_teacher_mean_predictor_loss(const example_teacher* teacher);

#ifdef __cplusplus
}
#endif

#endif /* QMESH_EXAMPLES_TEACHER_C_H_ */
