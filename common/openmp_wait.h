// How a training process's OpenMP threads wait for each other. libgomp reads OMP_WAIT_POLICY once,
// in its constructor, before main runs; unset, it lets a thread that waits for its team spin for a
// while (300,000 turns) first. On a box whose cores also run other work, that spinning burns the
// time slices the rest of the team needs: beside two busy loops on a 2-core VM bench_train stepped
// 2.2 to 3 times slower than with passive waiting, which costs 4 to 14% on the idle box. Training
// processes share their boxes (and ctest runs two suites at once), so they wait passively unless
// the environment chooses a policy.
#pragma once

namespace starling {

// Call first thing in main. When OMP_WAIT_POLICY is unset, sets it to passive and executes the
// program again in place (the same process id, arguments and otherwise the same environment), so
// that libgomp starts with it; returns only when the policy was set already or the exec failed
// (then the run goes on with libgomp's default, slower on a busy box).
void restart_unless_openmp_wait_policy_set(char** argv);

}  // namespace starling
