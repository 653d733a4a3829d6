// placeholder until the io stage lands
namespace kiln::io {}
