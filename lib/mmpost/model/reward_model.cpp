// Reward model: VLM + scalar head (see reward_model.h).
#include "mmpost/model/reward_model.h"

namespace mmpost::model {

torch::Tensor last_token_hidden(const torch::Tensor& hidden, const torch::Tensor& attention_mask) {
  TORCH_CHECK(hidden.dim() == 3 && attention_mask.dim() == 2 &&
                  hidden.size(0) == attention_mask.size(0) &&
                  hidden.size(1) == attention_mask.size(1),
              "last_token_hidden: hidden [B, T, C] and attention_mask [B, T] expected, got ",
              hidden.sizes(), " and ", attention_mask.sizes());
  const int64_t T = attention_mask.size(1);
  auto pos = torch::arange(T, attention_mask.options().dtype(torch::kLong));  // [T]
  auto last = (pos * (attention_mask != 0).to(torch::kLong)).amax(/*dim=*/-1);  // [B]
  auto index = last.view({-1, 1, 1}).expand({hidden.size(0), 1, hidden.size(2)});
  return hidden.gather(/*dim=*/1, index).squeeze(1);  // [B, C]
}

RewardModelImpl::RewardModelImpl(Vlm vlm, double init_std) {
  const int64_t C = vlm->config().text_config.hidden_size;
  model = register_module("model", std::move(vlm));
  score = register_module("score", torch::nn::Linear(torch::nn::LinearOptions(C, 1).bias(false)));
  {
    torch::NoGradGuard no_grad;
    score->weight.normal_(0.0, init_std);
  }
  auto params = model->parameters();
  if (!params.empty()) score->to(params.front().device(), params.front().scalar_type());
}

torch::Tensor RewardModelImpl::forward_features(const torch::Tensor& input_ids,
                                                const torch::Tensor& features,
                                                const torch::Tensor& attention_mask,
                                                const torch::Tensor& image_grid_thw) {
  auto mask = attention_mask.defined() ? attention_mask : torch::ones_like(input_ids);
  auto hidden = model->forward_hidden_features(input_ids, features, mask, image_grid_thw);
  auto last = last_token_hidden(hidden, mask);                              // [B, C]
  return score(last).squeeze(-1).to(torch::kFloat32);                      // [B]
}

torch::Tensor RewardModelImpl::forward(const torch::Tensor& input_ids, const Images& images,
                                       const torch::Tensor& attention_mask) {
  return forward_features(input_ids, images.empty() ? torch::Tensor() : model->image_features(images),
                          attention_mask, images.image_grid_thw);
}

}  // namespace mmpost::model
