// LLaVA projector (see projector.h); matches transformers' LlavaMultiModalProjector with one
// vision feature layer.
#include "mmpost/model/projector.h"

namespace mmpost::model {

ProjectorImpl::ProjectorImpl(const VlmConfig& c)
    : act_(activation_from_name(c.projector_hidden_act)) {
  const int64_t cv = c.vision_config.hidden_size, ct = c.text_config.hidden_size;
  const bool bias = c.multimodal_projector_bias;
  auto linear = [&](int64_t in, int64_t out) {
    return LoraLinear(torch::nn::LinearOptions(in, out).bias(bias));
  };
  linear_1 = register_module("linear_1", linear(cv, ct));
  linear_2 = register_module("linear_2", linear(ct, ct));
}

torch::Tensor ProjectorImpl::forward(const torch::Tensor& x) {
  return linear_2(apply_activation(linear_1(x), act_));
}

}  // namespace mmpost::model
