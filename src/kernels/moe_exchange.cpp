// The process-wide expert exchange (see moe_exchange.h).
#include "kernels/moe_exchange.h"

namespace k3 {

namespace {
ExpertExchange* g_exchange = nullptr;
ExpertTrainExchange* g_train_exchange = nullptr;
}

void set_expert_exchange(ExpertExchange* ex) { g_exchange = ex; }
ExpertExchange* expert_exchange() { return g_exchange; }
void set_expert_train_exchange(ExpertTrainExchange* ex) { g_train_exchange = ex; }
ExpertTrainExchange* expert_train_exchange() { return g_train_exchange; }

}  // namespace k3
