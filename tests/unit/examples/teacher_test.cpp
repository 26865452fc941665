// The examples' teacher task (examples/common): its C interface, which c_trainer uses, gives
// train_mlp's bits; a token depends only on (seed, step, token index); bad input is refused
// with a message, never an exception into C.
#include "teacher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "teacher_c.h"

namespace {

using ::testing::HasSubstr;

constexpr int64_t kHidden = 24;

TEST(ExampleTeacher, TheCInterfaceGivesTheSameBits) {
  const examples::TeacherTask task(kHidden, 7);
  qmesh::Tensor x(qmesh::DType::kFloat32, qmesh::Shape{5, kHidden}), t(x.dtype(), x.shape());
  task.batch(3, 11, x, t);
  example_teacher* c = example_teacher_create(kHidden, 7);
  ASSERT_NE(c, nullptr);
  std::vector<float> cx(5 * kHidden), ct(cx.size());
  ASSERT_EQ(example_teacher_batch(c, 3, 11, 5, cx.data(), ct.data()), 0);
  EXPECT_EQ(std::memcmp(cx.data(), x.data(), x.nbytes()), 0);
  EXPECT_EQ(std::memcmp(ct.data(), t.data(), t.nbytes()), 0);
  EXPECT_EQ(example_teacher_mean_predictor_loss(c), task.mean_predictor_loss());
  example_teacher_destroy(c);
}

// Tokens [2, 6) of a step drawn alone are tokens 2..5 of the same step drawn from 0; another
// step or seed draws other inputs.
TEST(ExampleTeacher, ATokenDependsOnlyOnSeedStepAndIndex) {
  const examples::TeacherTask task(kHidden, 7);
  qmesh::Tensor x(qmesh::DType::kFloat32, qmesh::Shape{6, kHidden}), t(x.dtype(), x.shape());
  qmesh::Tensor x2(x.dtype(), qmesh::Shape{4, kHidden}), t2(x.dtype(), x2.shape());
  task.batch(4, 0, x, t);
  task.batch(4, 2, x2, t2);
  for (int64_t i = 0; i < x2.numel(); ++i) {
    EXPECT_EQ(x2.data_as<float>()[i], x.data_as<float>()[2 * kHidden + i]) << i;
    EXPECT_NEAR(t2.data_as<float>()[i], t.data_as<float>()[2 * kHidden + i], 1e-5) << i;
  }
  task.batch(5, 2, x2, t2);
  EXPECT_NE(x2.data_as<float>()[0], x.data_as<float>()[2 * kHidden]);
}

TEST(ExampleTeacher, BadInputIsRefusedWithAMessage) {
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(example_teacher_create(0, 7), nullptr);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("the teacher's hidden size must be positive, got 0"));
  example_teacher* c = example_teacher_create(kHidden, 7);
  ASSERT_NE(c, nullptr);
  std::vector<float> x(kHidden), t(kHidden);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(example_teacher_batch(c, 1, 0, 1, nullptr, t.data()), -1);
  EXPECT_EQ(example_teacher_batch(c, 1, 0, -1, x.data(), t.data()), -1);
  const std::string messages = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(messages, HasSubstr("the teacher, x and t must not be NULL"));
  EXPECT_THAT(messages, HasSubstr("tokens must be >= 0, got -1"));
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(std::isnan(example_teacher_mean_predictor_loss(nullptr)));
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr("must not be NULL"));
  example_teacher_destroy(c);
  example_teacher_destroy(nullptr);  // a no-op
}

}  // namespace
